module @jit_flash_attention attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1x2x256x128xf32>, %arg1: tensor<1x2x256x128xf32>, %arg2: tensor<1x2x256x128xf32>) -> (tensor<1x2x256x128xf32> {jax.result_info = "result"}) {
    %0 = call @flash_attention(%arg0, %arg1, %arg2) : (tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>) -> tensor<1x2x256x128xf32>
    return %0 : tensor<1x2x256x128xf32>
  }
  func.func private @flash_attention(%arg0: tensor<1x2x256x128xf32>, %arg1: tensor<1x2x256x128xf32>, %arg2: tensor<1x2x256x128xf32>) -> tensor<1x2x256x128xf32> {
    %c = stablehlo.constant dense<true> : tensor<i1>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<0.0883883461> : tensor<f32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_2 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %c_3 = stablehlo.constant dense<256> : tensor<i32>
    %c_4 = stablehlo.constant dense<128> : tensor<i32>
    %c_5 = stablehlo.constant dense<0> : tensor<i32>
    %c_6 = stablehlo.constant dense<2> : tensor<i32>
    %c_7 = stablehlo.constant dense<1> : tensor<i32>
    %cst_8 = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<1x2x256x128xf32>
    %1 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<1x1x128x128xf32>
    %2 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<1x1x128x128xf32>
    %3 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<1x1x128x128xf32>
    %4 = stablehlo.multiply %c_7, %c_6 : tensor<i32>
    %5 = stablehlo.multiply %4, %c_6 : tensor<i32>
    %6 = stablehlo.multiply %5, %c_6 : tensor<i32>
    %7:13 = stablehlo.while(%iterArg = %6, %iterArg_9 = %c_5, %iterArg_10 = %c_5, %iterArg_11 = %c_5, %iterArg_12 = %c_5, %iterArg_13 = %c_5, %iterArg_14 = %arg0, %iterArg_15 = %arg1, %iterArg_16 = %arg2, %iterArg_17 = %0, %iterArg_18 = %1, %iterArg_19 = %2, %iterArg_20 = %3) : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>
    cond {
      %8 = stablehlo.convert %iterArg : tensor<i32>
      %9 = stablehlo.compare LT, %iterArg_9, %8, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %9 : tensor<i1>
    } do {
      %8 = stablehlo.multiply %c_7, %iterArg_10 : tensor<i32>
      %9 = stablehlo.multiply %c_7, %iterArg_11 : tensor<i32>
      %10 = stablehlo.multiply %c_4, %iterArg_12 : tensor<i32>
      %11 = stablehlo.multiply %c_7, %iterArg_10 : tensor<i32>
      %12 = stablehlo.multiply %c_7, %iterArg_11 : tensor<i32>
      %13 = stablehlo.multiply %c_4, %iterArg_13 : tensor<i32>
      %14 = stablehlo.multiply %c_7, %iterArg_10 : tensor<i32>
      %15 = stablehlo.multiply %c_7, %iterArg_11 : tensor<i32>
      %16 = stablehlo.multiply %c_4, %iterArg_13 : tensor<i32>
      %17 = stablehlo.multiply %c_7, %iterArg_10 : tensor<i32>
      %18 = stablehlo.multiply %c_7, %iterArg_11 : tensor<i32>
      %19 = stablehlo.multiply %c_4, %iterArg_12 : tensor<i32>
      %20 = stablehlo.compare LT, %8, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %21 = stablehlo.add %8, %c_7 : tensor<i32>
      %22 = stablehlo.select %20, %21, %8 : tensor<i1>, tensor<i32>
      %23 = stablehlo.compare LT, %9, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %24 = stablehlo.add %9, %c_6 : tensor<i32>
      %25 = stablehlo.select %23, %24, %9 : tensor<i1>, tensor<i32>
      %26 = stablehlo.compare LT, %10, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %27 = stablehlo.add %10, %c_3 : tensor<i32>
      %28 = stablehlo.select %26, %27, %10 : tensor<i1>, tensor<i32>
      %29 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %30 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %31 = stablehlo.select %29, %30, %c_5 : tensor<i1>, tensor<i32>
      %32 = stablehlo.dynamic_slice %iterArg_14, %22, %25, %28, %31, sizes = [1, 1, 128, 128] : (tensor<1x2x256x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
      %33 = stablehlo.compare LT, %11, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %34 = stablehlo.add %11, %c_7 : tensor<i32>
      %35 = stablehlo.select %33, %34, %11 : tensor<i1>, tensor<i32>
      %36 = stablehlo.compare LT, %12, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %37 = stablehlo.add %12, %c_6 : tensor<i32>
      %38 = stablehlo.select %36, %37, %12 : tensor<i1>, tensor<i32>
      %39 = stablehlo.compare LT, %13, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %40 = stablehlo.add %13, %c_3 : tensor<i32>
      %41 = stablehlo.select %39, %40, %13 : tensor<i1>, tensor<i32>
      %42 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %43 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %44 = stablehlo.select %42, %43, %c_5 : tensor<i1>, tensor<i32>
      %45 = stablehlo.dynamic_slice %iterArg_15, %35, %38, %41, %44, sizes = [1, 1, 128, 128] : (tensor<1x2x256x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
      %46 = stablehlo.compare LT, %14, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %47 = stablehlo.add %14, %c_7 : tensor<i32>
      %48 = stablehlo.select %46, %47, %14 : tensor<i1>, tensor<i32>
      %49 = stablehlo.compare LT, %15, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %50 = stablehlo.add %15, %c_6 : tensor<i32>
      %51 = stablehlo.select %49, %50, %15 : tensor<i1>, tensor<i32>
      %52 = stablehlo.compare LT, %16, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %53 = stablehlo.add %16, %c_3 : tensor<i32>
      %54 = stablehlo.select %52, %53, %16 : tensor<i1>, tensor<i32>
      %55 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %56 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %57 = stablehlo.select %55, %56, %c_5 : tensor<i1>, tensor<i32>
      %58 = stablehlo.dynamic_slice %iterArg_16, %48, %51, %54, %57, sizes = [1, 1, 128, 128] : (tensor<1x2x256x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
      %59 = stablehlo.compare LT, %17, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %60 = stablehlo.add %17, %c_7 : tensor<i32>
      %61 = stablehlo.select %59, %60, %17 : tensor<i1>, tensor<i32>
      %62 = stablehlo.compare LT, %18, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %63 = stablehlo.add %18, %c_6 : tensor<i32>
      %64 = stablehlo.select %62, %63, %18 : tensor<i1>, tensor<i32>
      %65 = stablehlo.compare LT, %19, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %66 = stablehlo.add %19, %c_3 : tensor<i32>
      %67 = stablehlo.select %65, %66, %19 : tensor<i1>, tensor<i32>
      %68 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %69 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %70 = stablehlo.select %68, %69, %c_5 : tensor<i1>, tensor<i32>
      %71 = stablehlo.dynamic_slice %iterArg_17, %61, %64, %67, %70, sizes = [1, 1, 128, 128] : (tensor<1x2x256x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
      %72 = stablehlo.compare EQ, %iterArg_13, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %73 = stablehlo.convert %72 : (tensor<i1>) -> tensor<i32>
      %74:3 = "stablehlo.case"(%73) ({
        stablehlo.return %iterArg_18, %iterArg_19, %iterArg_20 : tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>
      }, {
        %148 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
        %149 = stablehlo.broadcast_in_dim %148, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %150 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %151 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %152 = stablehlo.select %150, %151, %c_5 : tensor<i1>, tensor<i32>
        %153 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %154 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %155 = stablehlo.select %153, %154, %c_5 : tensor<i1>, tensor<i32>
        %156 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %157 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %158 = stablehlo.select %156, %157, %c_5 : tensor<i1>, tensor<i32>
        %159 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %160 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %161 = stablehlo.select %159, %160, %c_5 : tensor<i1>, tensor<i32>
        %162 = stablehlo.dynamic_update_slice %iterArg_18, %149, %152, %155, %158, %161 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %163 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
        %164 = stablehlo.broadcast_in_dim %163, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %165 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %166 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %167 = stablehlo.select %165, %166, %c_5 : tensor<i1>, tensor<i32>
        %168 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %169 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %170 = stablehlo.select %168, %169, %c_5 : tensor<i1>, tensor<i32>
        %171 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %172 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %173 = stablehlo.select %171, %172, %c_5 : tensor<i1>, tensor<i32>
        %174 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %175 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %176 = stablehlo.select %174, %175, %c_5 : tensor<i1>, tensor<i32>
        %177 = stablehlo.dynamic_update_slice %iterArg_19, %164, %167, %170, %173, %176 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %178 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
        %179 = stablehlo.broadcast_in_dim %178, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %180 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %181 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %182 = stablehlo.select %180, %181, %c_5 : tensor<i1>, tensor<i32>
        %183 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %184 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %185 = stablehlo.select %183, %184, %c_5 : tensor<i1>, tensor<i32>
        %186 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %187 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %188 = stablehlo.select %186, %187, %c_5 : tensor<i1>, tensor<i32>
        %189 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %190 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %191 = stablehlo.select %189, %190, %c_5 : tensor<i1>, tensor<i32>
        %192 = stablehlo.dynamic_update_slice %iterArg_20, %179, %182, %185, %188, %191 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        stablehlo.return %162, %177, %192 : tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>
      }) : (tensor<i32>) -> (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>)
      %75:9 = stablehlo.while(%iterArg_21 = %c_5, %iterArg_22 = %c_5, %iterArg_23 = %74#0, %iterArg_24 = %74#1, %iterArg_25 = %32, %iterArg_26 = %45, %iterArg_27 = %74#2, %iterArg_28 = %58, %iterArg_29 = %c_5) : tensor<i32>, tensor<i32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>
      cond {
        %148 = stablehlo.compare LT, %iterArg_21, %c_7, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %148 : tensor<i1>
      } do {
        %148 = stablehlo.add %iterArg_29, %c_7 : tensor<i32>
        %149 = stablehlo.multiply %iterArg_29, %c_4 : tensor<i32>
        %150 = stablehlo.add %c_5, %149 : tensor<i32>
        %151 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %152 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %153 = stablehlo.select %151, %152, %c_5 : tensor<i1>, tensor<i32>
        %154 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %155 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %156 = stablehlo.select %154, %155, %c_5 : tensor<i1>, tensor<i32>
        %157 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %158 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %159 = stablehlo.select %157, %158, %c_5 : tensor<i1>, tensor<i32>
        %160 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %161 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %162 = stablehlo.select %160, %161, %c_5 : tensor<i1>, tensor<i32>
        %163 = stablehlo.dynamic_slice %iterArg_23, %153, %156, %159, %162, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %164 = stablehlo.reshape %163 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %165 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %166 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %167 = stablehlo.select %165, %166, %c_5 : tensor<i1>, tensor<i32>
        %168 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %169 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %170 = stablehlo.select %168, %169, %c_5 : tensor<i1>, tensor<i32>
        %171 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %172 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %173 = stablehlo.select %171, %172, %c_5 : tensor<i1>, tensor<i32>
        %174 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %175 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %176 = stablehlo.select %174, %175, %c_5 : tensor<i1>, tensor<i32>
        %177 = stablehlo.dynamic_slice %iterArg_24, %167, %170, %173, %176, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %178 = stablehlo.reshape %177 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %179 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %180 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %181 = stablehlo.select %179, %180, %c_5 : tensor<i1>, tensor<i32>
        %182 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %183 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %184 = stablehlo.select %182, %183, %c_5 : tensor<i1>, tensor<i32>
        %185 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %186 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %187 = stablehlo.select %185, %186, %c_5 : tensor<i1>, tensor<i32>
        %188 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %189 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %190 = stablehlo.select %188, %189, %c_5 : tensor<i1>, tensor<i32>
        %191 = stablehlo.dynamic_slice %iterArg_25, %181, %184, %187, %190, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %192 = stablehlo.reshape %191 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %193 = stablehlo.convert %150 : tensor<i32>
        %194 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %195 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %196 = stablehlo.select %194, %195, %c_5 : tensor<i1>, tensor<i32>
        %197 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %198 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %199 = stablehlo.select %197, %198, %c_5 : tensor<i1>, tensor<i32>
        %200 = stablehlo.compare LT, %193, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %201 = stablehlo.add %193, %c_4 : tensor<i32>
        %202 = stablehlo.select %200, %201, %193 : tensor<i1>, tensor<i32>
        %203 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %204 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %205 = stablehlo.select %203, %204, %c_5 : tensor<i1>, tensor<i32>
        %206 = stablehlo.dynamic_slice %iterArg_26, %196, %199, %202, %205, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %207 = stablehlo.reshape %206 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %208 = stablehlo.dot_general %192, %207, contracting_dims = [1] x [1] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
        %209 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
        %210 = stablehlo.multiply %208, %209 : tensor<128x128xf32>
        %211 = stablehlo.reduce(%210 init: %cst_2) applies stablehlo.maximum across dimensions = [1] : (tensor<128x128xf32>, tensor<f32>) -> tensor<128xf32>
        %212 = stablehlo.broadcast_in_dim %211, dims = [0] : (tensor<128xf32>) -> tensor<128x1xf32>
        %213 = stablehlo.broadcast_in_dim %212, dims = [0, 1] : (tensor<128x1xf32>) -> tensor<128x128xf32>
        %214 = stablehlo.maximum %164, %213 : tensor<128x128xf32>
        %215 = stablehlo.reshape %214 : (tensor<128x128xf32>) -> tensor<1x128x1x128xf32>
        %216 = stablehlo.broadcast_in_dim %215, dims = [0, 1, 2, 3] : (tensor<1x128x1x128xf32>) -> tensor<1x128x1x128xf32>
        %217 = stablehlo.reshape %216 : (tensor<1x128x1x128xf32>) -> tensor<128x128xf32>
        %218 = stablehlo.subtract %210, %217 : tensor<128x128xf32>
        %219 = stablehlo.exponential %218 : tensor<128x128xf32>
        %220 = stablehlo.subtract %164, %214 : tensor<128x128xf32>
        %221 = stablehlo.exponential %220 : tensor<128x128xf32>
        %222 = stablehlo.multiply %221, %178 : tensor<128x128xf32>
        %223 = stablehlo.reduce(%219 init: %cst_1) applies stablehlo.add across dimensions = [1] : (tensor<128x128xf32>, tensor<f32>) -> tensor<128xf32>
        %224 = stablehlo.broadcast_in_dim %223, dims = [0] : (tensor<128xf32>) -> tensor<128x1xf32>
        %225 = stablehlo.broadcast_in_dim %224, dims = [0, 1] : (tensor<128x1xf32>) -> tensor<128x128xf32>
        %226 = stablehlo.add %225, %222 : tensor<128x128xf32>
        %227 = stablehlo.broadcast_in_dim %226, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %228 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %229 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %230 = stablehlo.select %228, %229, %c_5 : tensor<i1>, tensor<i32>
        %231 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %232 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %233 = stablehlo.select %231, %232, %c_5 : tensor<i1>, tensor<i32>
        %234 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %235 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %236 = stablehlo.select %234, %235, %c_5 : tensor<i1>, tensor<i32>
        %237 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %238 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %239 = stablehlo.select %237, %238, %c_5 : tensor<i1>, tensor<i32>
        %240 = stablehlo.dynamic_update_slice %iterArg_24, %227, %230, %233, %236, %239 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %241 = stablehlo.broadcast_in_dim %214, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %242 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %243 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %244 = stablehlo.select %242, %243, %c_5 : tensor<i1>, tensor<i32>
        %245 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %246 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %247 = stablehlo.select %245, %246, %c_5 : tensor<i1>, tensor<i32>
        %248 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %249 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %250 = stablehlo.select %248, %249, %c_5 : tensor<i1>, tensor<i32>
        %251 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %252 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %253 = stablehlo.select %251, %252, %c_5 : tensor<i1>, tensor<i32>
        %254 = stablehlo.dynamic_update_slice %iterArg_23, %241, %244, %247, %250, %253 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %255 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
        %256 = stablehlo.compare EQ, %226, %255, FLOAT : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xi1>
        %257 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
        %258 = stablehlo.divide %257, %226 : tensor<128x128xf32>
        %259 = func.call @_where(%256, %cst, %258) : (tensor<128x128xi1>, tensor<f32>, tensor<128x128xf32>) -> tensor<128x128xf32>
        %260 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %261 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %262 = stablehlo.select %260, %261, %c_5 : tensor<i1>, tensor<i32>
        %263 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %264 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %265 = stablehlo.select %263, %264, %c_5 : tensor<i1>, tensor<i32>
        %266 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %267 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %268 = stablehlo.select %266, %267, %c_5 : tensor<i1>, tensor<i32>
        %269 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %270 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %271 = stablehlo.select %269, %270, %c_5 : tensor<i1>, tensor<i32>
        %272 = stablehlo.dynamic_slice %iterArg_27, %262, %265, %268, %271, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %273 = stablehlo.reshape %272 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %274 = stablehlo.multiply %222, %259 : tensor<128x128xf32>
        %275 = stablehlo.reshape %274 : (tensor<128x128xf32>) -> tensor<1x128x1x128xf32>
        %276 = stablehlo.broadcast_in_dim %275, dims = [0, 1, 2, 3] : (tensor<1x128x1x128xf32>) -> tensor<1x128x1x128xf32>
        %277 = stablehlo.reshape %276 : (tensor<1x128x1x128xf32>) -> tensor<128x128xf32>
        %278 = stablehlo.multiply %273, %277 : tensor<128x128xf32>
        %279 = stablehlo.broadcast_in_dim %278, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %280 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %281 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %282 = stablehlo.select %280, %281, %c_5 : tensor<i1>, tensor<i32>
        %283 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %284 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %285 = stablehlo.select %283, %284, %c_5 : tensor<i1>, tensor<i32>
        %286 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %287 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %288 = stablehlo.select %286, %287, %c_5 : tensor<i1>, tensor<i32>
        %289 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %290 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %291 = stablehlo.select %289, %290, %c_5 : tensor<i1>, tensor<i32>
        %292 = stablehlo.dynamic_update_slice %iterArg_27, %279, %282, %285, %288, %291 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %293 = stablehlo.convert %150 : tensor<i32>
        %294 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %295 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %296 = stablehlo.select %294, %295, %c_5 : tensor<i1>, tensor<i32>
        %297 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %298 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %299 = stablehlo.select %297, %298, %c_5 : tensor<i1>, tensor<i32>
        %300 = stablehlo.compare LT, %293, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %301 = stablehlo.add %293, %c_4 : tensor<i32>
        %302 = stablehlo.select %300, %301, %293 : tensor<i1>, tensor<i32>
        %303 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %304 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %305 = stablehlo.select %303, %304, %c_5 : tensor<i1>, tensor<i32>
        %306 = stablehlo.dynamic_slice %iterArg_28, %296, %299, %302, %305, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %307 = stablehlo.reshape %306 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %308 = stablehlo.dot_general %219, %307, contracting_dims = [1] x [0] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
        %309 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %310 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %311 = stablehlo.select %309, %310, %c_5 : tensor<i1>, tensor<i32>
        %312 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %313 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %314 = stablehlo.select %312, %313, %c_5 : tensor<i1>, tensor<i32>
        %315 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %316 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %317 = stablehlo.select %315, %316, %c_5 : tensor<i1>, tensor<i32>
        %318 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %319 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %320 = stablehlo.select %318, %319, %c_5 : tensor<i1>, tensor<i32>
        %321 = stablehlo.dynamic_slice %292, %311, %314, %317, %320, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %322 = stablehlo.reshape %321 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %323 = stablehlo.reshape %259 : (tensor<128x128xf32>) -> tensor<1x128x1x128xf32>
        %324 = stablehlo.broadcast_in_dim %323, dims = [0, 1, 2, 3] : (tensor<1x128x1x128xf32>) -> tensor<1x128x1x128xf32>
        %325 = stablehlo.reshape %324 : (tensor<1x128x1x128xf32>) -> tensor<128x128xf32>
        %326 = stablehlo.multiply %308, %325 : tensor<128x128xf32>
        %327 = stablehlo.add %322, %326 : tensor<128x128xf32>
        %328 = stablehlo.broadcast_in_dim %327, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %329 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %330 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %331 = stablehlo.select %329, %330, %c_5 : tensor<i1>, tensor<i32>
        %332 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %333 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %334 = stablehlo.select %332, %333, %c_5 : tensor<i1>, tensor<i32>
        %335 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %336 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %337 = stablehlo.select %335, %336, %c_5 : tensor<i1>, tensor<i32>
        %338 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %339 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %340 = stablehlo.select %338, %339, %c_5 : tensor<i1>, tensor<i32>
        %341 = stablehlo.dynamic_update_slice %292, %328, %331, %334, %337, %340 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %342 = stablehlo.add %iterArg_22, %c_7 : tensor<i32>
        %343 = stablehlo.add %iterArg_21, %c_7 : tensor<i32>
        stablehlo.return %343, %342, %254, %240, %iterArg_25, %iterArg_26, %341, %iterArg_28, %148 : tensor<i32>, tensor<i32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>
      }
      %76 = stablehlo.compare EQ, %iterArg_13, %c_7, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %77 = stablehlo.convert %76 : (tensor<i1>) -> tensor<i32>
      %78 = "stablehlo.case"(%77) ({
        stablehlo.return %71 : tensor<1x1x128x128xf32>
      }, {
        %148 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %149 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %150 = stablehlo.select %148, %149, %c_5 : tensor<i1>, tensor<i32>
        %151 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %152 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %153 = stablehlo.select %151, %152, %c_5 : tensor<i1>, tensor<i32>
        %154 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %155 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %156 = stablehlo.select %154, %155, %c_5 : tensor<i1>, tensor<i32>
        %157 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %158 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %159 = stablehlo.select %157, %158, %c_5 : tensor<i1>, tensor<i32>
        %160 = stablehlo.dynamic_slice %75#6, %150, %153, %156, %159, sizes = [1, 1, 128, 128] : (tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        %161 = stablehlo.reshape %160 : (tensor<1x1x128x128xf32>) -> tensor<128x128xf32>
        %162 = stablehlo.broadcast_in_dim %161, dims = [2, 3] : (tensor<128x128xf32>) -> tensor<1x1x128x128xf32>
        %163 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %164 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %165 = stablehlo.select %163, %164, %c_5 : tensor<i1>, tensor<i32>
        %166 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %167 = stablehlo.add %c_5, %c_7 : tensor<i32>
        %168 = stablehlo.select %166, %167, %c_5 : tensor<i1>, tensor<i32>
        %169 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %170 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %171 = stablehlo.select %169, %170, %c_5 : tensor<i1>, tensor<i32>
        %172 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %173 = stablehlo.add %c_5, %c_4 : tensor<i32>
        %174 = stablehlo.select %172, %173, %c_5 : tensor<i1>, tensor<i32>
        %175 = stablehlo.dynamic_update_slice %71, %162, %165, %168, %171, %174 : (tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x128x128xf32>
        stablehlo.return %175 : tensor<1x1x128x128xf32>
      }) : (tensor<i32>) -> tensor<1x1x128x128xf32>
      %79 = stablehlo.compare LT, %8, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %80 = stablehlo.add %8, %c_7 : tensor<i32>
      %81 = stablehlo.select %79, %80, %8 : tensor<i1>, tensor<i32>
      %82 = stablehlo.compare LT, %9, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %83 = stablehlo.add %9, %c_6 : tensor<i32>
      %84 = stablehlo.select %82, %83, %9 : tensor<i1>, tensor<i32>
      %85 = stablehlo.compare LT, %10, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %86 = stablehlo.add %10, %c_3 : tensor<i32>
      %87 = stablehlo.select %85, %86, %10 : tensor<i1>, tensor<i32>
      %88 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %89 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %90 = stablehlo.select %88, %89, %c_5 : tensor<i1>, tensor<i32>
      %91 = stablehlo.dynamic_update_slice %iterArg_14, %75#4, %81, %84, %87, %90 : (tensor<1x2x256x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x256x128xf32>
      %92 = stablehlo.compare LT, %11, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %93 = stablehlo.add %11, %c_7 : tensor<i32>
      %94 = stablehlo.select %92, %93, %11 : tensor<i1>, tensor<i32>
      %95 = stablehlo.compare LT, %12, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %96 = stablehlo.add %12, %c_6 : tensor<i32>
      %97 = stablehlo.select %95, %96, %12 : tensor<i1>, tensor<i32>
      %98 = stablehlo.compare LT, %13, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %99 = stablehlo.add %13, %c_3 : tensor<i32>
      %100 = stablehlo.select %98, %99, %13 : tensor<i1>, tensor<i32>
      %101 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %102 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %103 = stablehlo.select %101, %102, %c_5 : tensor<i1>, tensor<i32>
      %104 = stablehlo.dynamic_update_slice %iterArg_15, %75#5, %94, %97, %100, %103 : (tensor<1x2x256x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x256x128xf32>
      %105 = stablehlo.compare LT, %14, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %106 = stablehlo.add %14, %c_7 : tensor<i32>
      %107 = stablehlo.select %105, %106, %14 : tensor<i1>, tensor<i32>
      %108 = stablehlo.compare LT, %15, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %109 = stablehlo.add %15, %c_6 : tensor<i32>
      %110 = stablehlo.select %108, %109, %15 : tensor<i1>, tensor<i32>
      %111 = stablehlo.compare LT, %16, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %112 = stablehlo.add %16, %c_3 : tensor<i32>
      %113 = stablehlo.select %111, %112, %16 : tensor<i1>, tensor<i32>
      %114 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %115 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %116 = stablehlo.select %114, %115, %c_5 : tensor<i1>, tensor<i32>
      %117 = stablehlo.dynamic_update_slice %iterArg_16, %75#7, %107, %110, %113, %116 : (tensor<1x2x256x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x256x128xf32>
      %118 = stablehlo.compare LT, %17, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %119 = stablehlo.add %17, %c_7 : tensor<i32>
      %120 = stablehlo.select %118, %119, %17 : tensor<i1>, tensor<i32>
      %121 = stablehlo.compare LT, %18, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %122 = stablehlo.add %18, %c_6 : tensor<i32>
      %123 = stablehlo.select %121, %122, %18 : tensor<i1>, tensor<i32>
      %124 = stablehlo.compare LT, %19, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %125 = stablehlo.add %19, %c_3 : tensor<i32>
      %126 = stablehlo.select %124, %125, %19 : tensor<i1>, tensor<i32>
      %127 = stablehlo.compare LT, %c_5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %128 = stablehlo.add %c_5, %c_4 : tensor<i32>
      %129 = stablehlo.select %127, %128, %c_5 : tensor<i1>, tensor<i32>
      %130 = stablehlo.dynamic_update_slice %iterArg_17, %78, %120, %123, %126, %129 : (tensor<1x2x256x128xf32>, tensor<1x1x128x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x256x128xf32>
      %131 = stablehlo.add %iterArg_9, %c_7 : tensor<i32>
      %132 = stablehlo.add %iterArg_13, %c_7 : tensor<i32>
      %133 = func.call @_where_0(%c, %132, %iterArg_13) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %134 = stablehlo.compare EQ, %133, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %135 = func.call @_where_1(%134, %c_5, %133) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %136 = stablehlo.add %iterArg_12, %c_7 : tensor<i32>
      %137 = func.call @_where_0(%134, %136, %iterArg_12) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %138 = stablehlo.compare EQ, %137, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %139 = func.call @_where_1(%138, %c_5, %137) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %140 = stablehlo.add %iterArg_11, %c_7 : tensor<i32>
      %141 = func.call @_where_0(%138, %140, %iterArg_11) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %142 = stablehlo.compare EQ, %141, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %143 = func.call @_where_1(%142, %c_5, %141) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %144 = stablehlo.add %iterArg_10, %c_7 : tensor<i32>
      %145 = func.call @_where_0(%142, %144, %iterArg_10) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %146 = stablehlo.compare EQ, %145, %c_7, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %147 = func.call @_where_1(%146, %c_5, %145) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      stablehlo.return %iterArg, %131, %147, %143, %139, %135, %91, %104, %117, %130, %75#2, %75#3, %75#6 : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>, tensor<1x2x256x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>, tensor<1x1x128x128xf32>
    }
    return %7#9 : tensor<1x2x256x128xf32>
  }
  func.func private @_where(%arg0: tensor<128x128xi1>, %arg1: tensor<f32>, %arg2: tensor<128x128xf32>) -> tensor<128x128xf32> {
    %0 = stablehlo.convert %arg1 : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
    %2 = stablehlo.select %arg0, %1, %arg2 : tensor<128x128xi1>, tensor<128x128xf32>
    return %2 : tensor<128x128xf32>
  }
  func.func private @_where_0(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @_where_1(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<i1>, tensor<i32>
    return %1 : tensor<i32>
  }
}
